"""Stage 2: training the gate's theta on zero-shot prompts (the model frozen).

``AlphaTrainer.fit`` trains theta alone (``gate.AlphaGate``, alpha = sigmoid(theta))
with Adam on the cross-entropy of the answer's first token (or, with
``SelectionConfig.objective = "sequence"``, of every answer token and the end of the
answer, ``objectives.py``), validating every
``eval_every`` steps and keeping the theta with the lowest valid loss
(``training.train_loop``, the loop every trained method shares).

Fast path (default): the injection only changes the last prompt token, so every
earlier position's keys and values do not depend on alpha. They are computed
once per prompt (``prompt_cache.PromptCache``) and each step runs only the last
token (with the teacher-forced objectives, the last token and the answer
tokens: ``objectives.SequenceCache``) against them, on the model's backend (packed weights where the model
allows, the hooked model otherwise; ``EngineConfig.backend``). The naive
path (``EngineConfig(fast=False)``) runs whole prompts through the hooked model; tests
check all of them agree.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from ..config import TEACHER_FORCED, EngineConfig, SelectionConfig
from ..engine.backend import Backend, backend_for
from ..engine.prompt_cache import PromptCache
from ..gate import AlphaGate
from ..tokens import Example
from ..types import Model
from .objectives import SequenceCache, sequence_loss
from .training import TrainHistory, first_token_loss, frozen, schedule, train_loop

log = logging.getLogger(__name__)


class AlphaTrainer:
    """Trains an ``AlphaGate`` for one task embedding on a frozen model.

    Example:
        >>> import torch
        >>> import site_lens as sl
        >>> from site_lens.tokens import Example
        >>> model = sl.tiny_model()
        >>> t = sl.build_task_embedding(model, [[1, 5, 7, 2, 9, 4], [3, 5, 8, 2, 6]])
        >>> train = [Example(tokens=[1, 5], target=7), Example(tokens=[3, 5], target=8)]  # prompt, answer token
        >>> trainer = AlphaTrainer(model, t, sl.SelectionConfig(steps=4, eval_every=2), seed=0)
        >>> gate = trainer.fit(train, valid=train)
        >>> gate.alpha().shape, len(trainer.history.loss)
        (torch.Size([2, 4]), 4)
    """

    def __init__(
        self,
        model: Model,
        t: Float[Tensor, "layer head_index d_head"],
        cfg: SelectionConfig | None = None,
        seed: int = 0,
        gate: AlphaGate | None = None,
        engine: EngineConfig | None = None,
    ):
        self.model = model
        self.cfg = cfg or SelectionConfig()
        self.engine = engine or EngineConfig()
        self.seed = seed
        self.t = t.to(device=model.cfg.device, dtype=model.cfg.dtype)
        self.gate = gate if gate is not None else AlphaGate(model.cfg.n_layers, model.cfg.n_heads, self.cfg.theta_init)
        self.gate.to(model.cfg.device)
        self.generator: torch.Generator | None = None  # noise of a stochastic gate's training alpha
        self.history = TrainHistory()

    def penalty(self) -> Tensor | None:
        """A term added to every training and validation loss; SITE has none (``sparse.SparseTrainer`` does)."""
        return None

    def _penalised(self, loss: Tensor) -> Tensor:
        extra = self.penalty()
        return loss if extra is None else loss + extra

    # ------------------------------------------------------------ losses

    def loss_naive(self, examples: Sequence[Example], backward: bool = False) -> Tensor:
        """Mean first-token CE with whole prompts run through the hooked model (the reference).

        Memory-capped chunks as in ``training.first_token_loss``; with ``backward`` the gradient
        is accumulated chunk by chunk and the loss comes back detached.
        """
        prefill = lambda last: self.gate.hooks(self.model, self.t, last)
        if self.cfg.objective in TEACHER_FORCED:
            ce = sequence_loss(self.model, examples, prefill, backward=backward)
        else:
            ce = first_token_loss(
                self.model, examples, prefill=prefill, batch_size=max(1, len(examples)), backward=backward
            )
        extra = self.penalty()
        if extra is None:
            return ce
        if backward:
            extra.backward()
            extra = extra.detach()
        return ce + extra

    def loss_fast(self, cache: PromptCache | SequenceCache, indices: Sequence[int], train: bool = False) -> Tensor:
        """The same loss, running only the last prompt token against cached prefixes.

        ``train`` injects the gate's training alpha (``AlphaGate.train_alpha``: SITE's is alpha
        itself, a hard-concrete gate draws its noise); otherwise the deterministic alpha.
        """
        alpha = self.gate.train_alpha(self.generator) if train else self.gate.alpha()
        return self._penalised(cache.loss(indices, alpha, self.t))

    def backend(self) -> Backend:
        """The backend the fast path runs on (``EngineConfig.backend``; 'auto' chooses per model)."""
        return backend_for(self.model, self.engine.backend)  # 'auto' defers to use_backend(model, ...)

    def _cache(self, examples: Sequence[Example], backend: Backend) -> PromptCache | SequenceCache:
        if self.cfg.objective in TEACHER_FORCED:
            return SequenceCache(self.model, examples, backend=backend)
        return PromptCache(self.model, examples, backend=backend)

    # ------------------------------------------------------------ training

    def schedule(self, n_train: int) -> list[list[int]]:
        """Indices of the training examples for each step: a seeded permutation, cycled."""
        return schedule(n_train, self.cfg.steps, self.cfg.batch_size, self.seed)

    def fit(
        self,
        train: Sequence[Example],
        valid: Sequence[Example] = (),
        progress: Callable[[int, float], None] | None = None,
    ) -> AlphaGate:
        """Train theta; returns the gate holding the best (or last) theta."""
        if not train:
            raise ValueError("AlphaTrainer.fit needs at least one training example")
        cfg = self.cfg
        valid = list(valid)[: cfg.max_valid]
        plan = self.schedule(len(train))
        validate = bool(valid and cfg.eval_every)
        with frozen(self.model):
            if self.engine.fast:
                backend = self.backend()
                self.backend_used = backend
                used = sorted({i for b in plan for i in b})
                remap = {i: j for j, i in enumerate(used)}
                tr_cache = self._cache([train[i] for i in used], backend) if used else None
                va_cache = self._cache(valid, backend) if validate else None

                def step_loss(batch: Sequence[int]) -> Tensor:
                    assert tr_cache is not None
                    return self.loss_fast(tr_cache, [remap[i] for i in batch], train=True)

                def valid_loss() -> float:
                    assert va_cache is not None
                    with torch.no_grad():
                        return float(self.loss_fast(va_cache, range(len(valid))))
            else:  # whole prompts: gradients accumulated over memory-capped chunks
                self.backend_used = backend_for(self.model, "hooked")

                def step_loss(batch: Sequence[int]) -> Tensor:
                    return self.loss_naive([train[i] for i in batch], backward=True)

                def valid_loss() -> float:
                    with torch.no_grad():
                        return float(self.loss_naive(valid))

            self.history = train_loop(
                [self.gate.theta],
                plan,
                step_loss,
                valid_loss if validate else None,
                lr=cfg.lr,
                eval_every=cfg.eval_every,
                keep_best=cfg.keep_best,
                progress=progress,
            )
        return self.gate
