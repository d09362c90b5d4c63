"""The agent loop and final-answer extraction."""
