"""The sandbox: run model-written code (and document readers) in a confined child process."""
