"""The commands of ``python -m flowllm.inspect``, one module each; ``flowllm.inspect.cli`` registers and runs them.

``common`` holds what they share (their errors, ``RunCommand``, opening a run), ``render`` how they draw.
"""
