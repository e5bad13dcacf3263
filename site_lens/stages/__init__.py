"""SITE's stages and the objectives they train on.

  embeddings  stage 1: the task embedding, mean hook_z at the last prompt token
  selection   stage 2: the gate's theta trained on zero-shot prompts
  training    the training loop every trained method uses, and the whole-prompt loss
  objectives  the answer-sequence and option-token objectives
"""
