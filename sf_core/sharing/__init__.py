"""Sharing trained agents: export (TorchScript, ONNX) and the Hugging Face Hub model card."""
