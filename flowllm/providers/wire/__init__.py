"""The wire protocols: requests built and replies normalised for each API, and model quirks."""
