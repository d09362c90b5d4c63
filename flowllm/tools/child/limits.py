"""Resource limits for a sandboxed child, set before anything else is imported there (stdlib only)."""

import resource


def set_limit(kind: int, value: int) -> None:
    """Set one resource limit (soft = hard), never above the hard limit already in force; where it cannot be
    set, leave it."""
    try:
        _soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass
