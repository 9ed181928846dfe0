"""TorchServe's room: the only code that reads TorchServe's context, messages and metrics, and the
handler files a `.mar` names."""
