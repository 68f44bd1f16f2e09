"""fxformer: the original Transformer ("Attention Is All You Need") in JAX/Flax.

    import fxformer
    run = fxformer.load("runs/default")        # a trained workdir's checkpoint (fxformer.api)
    run.translate(["The old teacher has helped the boy."])

Importing fxformer imports no JAX: `load` brings in fxformer.api (and JAX) on first use, so that
the launcher's modules stay light.
"""

_API = ("load", "TrainedRun", "Score")


def __getattr__(name: str):
    if name in _API:
        from fxformer import api

        return getattr(api, name)
    raise AttributeError(f"module 'fxformer' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
