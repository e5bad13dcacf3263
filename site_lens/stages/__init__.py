"""SITE's three stages, the objectives they train on, and stage 2's variants.

  embeddings         stage 1: the task embedding, mean hook_z at the last prompt token
  selection          stage 2: the gate's theta trained on zero-shot prompts
  selection_batched  stage 2 for many tasks in one loop, one theta per task
  sparse             stage 2 with a price on every open head (L0 or L1): sparse SITE
  shared             stage 2 with one theta over many tasks, each with its own t
  training           the training loop every trained method uses, and the whole-prompt loss
  objectives         the answer-sequence and option-token objectives
  generation         stage 3: greedy generation with SITE injected once, at prefill
  options            stage 3 for multiple choice: each option's log-likelihood under the injection
"""
