"""Models: loading (embedded GGUF files, hub names), conversion, weight cache, identity, the two engines.

``load_model`` is the one way in; ``engines`` says which TransformerLens engine a
model object is (HookedTransformer on TransformerLens 3.x, TransformerBridge on
3.9 and 4.x) and gives the annotation type ``Model`` for either.
"""

from .load import *  # the loading API, as load.__all__ lists it
from .load import __all__ as __all__
