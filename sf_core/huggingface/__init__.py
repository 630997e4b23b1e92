"""Sharing trained agents on the Hugging Face Hub: `python -m sf_core.huggingface.push_to_hub` and
`python -m sf_core.huggingface.load_from_hub` (the `huggingface` extra; entry modules only, the code is in
sf_core/cli/ and sf_core/sharing/); see docs/sharing.md."""
