"""OpenAI-compatible HTTP gateway in front of the `tts` model (docs/design/gateway.md).

Pure parts (importable without a server, unit-tested): :mod:`.errors` (the OpenAI error shape),
:mod:`.speech` (request validation and its mapping to `tts` inputs), :mod:`.audio` (resampling and
streaming encoders), :mod:`.voices` (the on-disk voice store). :mod:`.upstream` talks to Triton
over ``tritonclient.grpc.aio``; :mod:`.app` is the thin FastAPI layer; :mod:`.main` the command.
"""
