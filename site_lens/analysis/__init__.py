"""Analyses of trained gates: which heads carry the effect, and how few suffice (their trainers are in stages/).

  patching    head-level patching: top-k heads by alpha against SITE's soft gate
  attribution every head's patching effect to first order, from one backward pass per batch
  cie         the causal indirect effect of each head (Function Vectors' head ranking)
  overlap     cross-task head overlap and transfer
  minimal     head sets scored: accuracy against the number of heads
  plots       figures in the house theme
"""
