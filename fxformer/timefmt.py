"""Durations as people read them; imports nothing, so the no-JAX launcher shares it."""


def duration(seconds: float) -> str:
    """12345 -> '3h25m45s'."""
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
