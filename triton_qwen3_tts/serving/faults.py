"""Failures that end a request with Triton's UNAVAILABLE: the server cannot serve it now, and a
retry (later, or on another server) may succeed. ``errors.error_code_name`` maps them."""


class Unavailable(RuntimeError):
    """Base of the UNAVAILABLE failures."""


class Stalled(Unavailable):
    """A request made no progress (no talker frames, no audio) for ``request_deadline_s``."""


class PeerDied(Unavailable):
    """A model this one calls (talker, codec) lost its process: nothing in it will answer."""
