"""Assert that a compiled module equals the reference engine: outputs and gradients."""
from __future__ import annotations

import torch

import neurovec
from neurovec.engines.reference import ReferenceModule


def outputs_and_grads(module: torch.nn.Module, seed: int = 0):
    """Outputs, and the gradient of a random projection of them w.r.t. every learnable weight."""
    out = module()
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    names = [n for n, _ in module.weights.items() if isinstance(module.weights[n], torch.nn.Parameter)]
    params = [module.weights[n] for n in names]
    if not params or not out.requires_grad:
        return out.detach(), {n: None for n in names}
    grads = torch.autograd.grad((out * projection).sum(), params, allow_unused=True)
    return out.detach(), {n: g for n, g in zip(names, grads)}


def assert_equivalent(graph: neurovec.Graph, compiled: torch.nn.Module, tol: float = 1e-9) -> None:
    reference = ReferenceModule(graph, torch.float64)
    compiled = compiled.double()
    out_ref, grad_ref = outputs_and_grads(reference)
    out, grad = outputs_and_grads(compiled)
    torch.testing.assert_close(out, out_ref, atol=tol, rtol=tol, equal_nan=True)
    assert grad.keys() == grad_ref.keys()
    for name in grad_ref:
        expected, actual = grad_ref[name], grad[name]
        if expected is None or actual is None:
            # Unused by the outputs: torch reports None; the other side must then be None or zero
            # (the compiler computes no neuron the outputs do not reach: compiler/prune.py).
            other = actual if expected is None else expected
            assert other is None or torch.all(other == 0), \
                f"gradient of {name!r}: {expected} vs {actual}"
            continue
        torch.testing.assert_close(actual, expected, atol=tol, rtol=tol, equal_nan=True,
                                   msg=lambda m: f"gradient of weight {name!r}: {m}")
