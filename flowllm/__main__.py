"""``python -m flowllm``: the Hydra application (see flowllm.app)."""

from flowllm.app import main

if __name__ == "__main__":
    main()
