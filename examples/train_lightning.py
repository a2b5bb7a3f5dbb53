"""Mini-batch GIN on MUTAG with PyTorch Lightning: neurovec's batches go through Lightning unchanged.

    pip install lightning; python examples/train_lightning.py [--data-dir ../shared/data/tu]
"""
import argparse, functools, os
import lightning, torch, torch.nn.functional as F
import neurovec
from neurovec import datasets

parser = argparse.ArgumentParser()
parser.add_argument("--data-dir", default=os.environ.get("NEUROVEC_DATA"))
ds = datasets.load_tu("MUTAG", data_dir=parser.parse_args().data_dir)
model = neurovec.MiniBatchModel(functools.partial(datasets.gin, ds, hidden=16, seed=0))
loader = neurovec.SampleLoader(model, range(150), batch_size=32, shuffle=True, seed=0)  # fixed batches, compiled once
labels = torch.tensor(ds.graph_labels, dtype=torch.float32)


class GIN(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = model                                     # the weights, once

    def training_step(self, batch, index):                     # batch: a neurovec.MiniBatch
        loss = F.binary_cross_entropy(self.model(batch).squeeze(-1), labels[batch.samples])
        self.log("loss", loss, batch_size=len(batch), prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


lightning.Trainer(max_epochs=5, accelerator="cpu", logger=False, enable_checkpointing=False).fit(GIN(), loader)
