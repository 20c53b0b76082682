"""Print the folder to put on a vLLM server's PYTHONPATH for `--middleware flywheel_token_auth.TokenAuth`."""

from flywheel.generation.vllm.middleware import PATH

print(PATH)
