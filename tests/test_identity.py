"""Model identity: registered for site-lens's own models, never stored on the model."""

import gc

from site_lens.convert import new_hooked
from site_lens.identity import model_identity
from site_lens.tiny import build_cfg, tiny_model


def test_identity_is_not_stored_on_the_model():
    before = set(vars(new_hooked(build_cfg())))
    model = tiny_model()
    model_identity(model)
    assert set(vars(model)) == before
    from site_lens import identity

    gc.collect()  # drop the entries of models other tests left behind
    n = len(identity._REGISTRY)
    del model
    gc.collect()
    assert len(identity._REGISTRY) == n - 1  # the entry went with its model
