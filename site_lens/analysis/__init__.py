"""Analyses of trained gates: which heads carry the effect, and how few suffice.

  patching    head-level patching: top-k heads by alpha against SITE's soft gate
  attribution every head's patching effect to first order, from one backward pass per batch
  cie         the causal indirect effect of each head (Function Vectors' head ranking)
  overlap     cross-task head overlap and transfer
  sparse      sparse SITE: an L0 or L1 price on every open head
  minimal     head sets scored: accuracy against the number of heads
  multitask   one gate trained over many tasks, each with its own t
  plots       figures in the house theme
"""
