"""What `nbdist demo` runs: the digits data, a small CNN and its training on nbdist's engines.

- `nbdist.app.data`: the digits images bundled with nbdist (no scikit-learn, no download).
- `nbdist.app.training`: the model and the engine side of the job (runs inside each engine,
  with the engine's `MultiWorkerMirroredStrategy`).
- `nbdist.app.engine_demo`: the notebook/terminal side: starts the engines with `nd.Cluster`,
  drives the epochs, shows progress, writes the metrics and the picture, stops the engines.

Front-end layer. Importing this package starts nothing.

Example:
    >>> from nbdist.app.datasets import load_digits
    >>> load_digits().x_train.shape
    torch.Size([1437, 64])
"""
