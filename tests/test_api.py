"""The public surface is small and deliberate: changing it should be a conscious act."""
import neurovec


def test_public_names():
    assert sorted(neurovec.__all__) == sorted([
        "FactLayer", "Graph", "GraphBuilder", "GraphError", "NeuronLayer", "Program", "Ref", "ReferenceModule",
        "Settings", "Weight", "autotune", "compile", "iter_presets", "list_presets", "load_json", "save_json",
        "MiniBatch", "MiniBatchModel", "SampleLoader", "set_progress", "ClusterLoader"])
    for name in neurovec.__all__:
        assert getattr(neurovec, name) is not None
