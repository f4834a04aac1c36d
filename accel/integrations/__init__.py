"""accel inside the training libraries people already use.

* :mod:`accel.integrations.lightning`: a Lightning accelerator backed by any accel
  accelerator, and strategies for the Trainer and for Fabric that move models with
  accel (``pip install 'lightning>=2.5'``).
* :mod:`accel.integrations.accelerate`: Hugging Face Accelerate's ``prepare`` with
  ties kept on TPU (``pip install 'accelerate>=1.0'``).
* :mod:`accel.integrations.ray`: Ray Train's ``TorchTrainer`` on any accel
  accelerator, with its backend, ties kept (``pip install 'accel-torch[ray]'``).

Nothing here is imported by ``import accel``; each module imports its library when
it is itself imported. See ``docs/integrations.md``.
"""

__all__: list[str] = []  # each integration is a module of its own, with its names
