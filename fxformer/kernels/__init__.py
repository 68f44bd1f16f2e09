"""Kernels the training step can use in place of XLA's own code, each behind a named model
option (`fxformer/schema.py`, section `model`) whose default keeps the step as it was
(`pallas.py`: what the Pallas kernels share, where they run and how they are called):

- `attention.py`: attention that knows the packing, a Pallas kernel (Triton on a GPU, the
  interpreter elsewhere) that computes only the tiles a segment can see;
- `segments.py`: the packing as cuDNN's packed-segment layout (offsets and lengths per
  segment), and the call of cuDNN's fused attention with it;
- `dropout.py`: dropout from 8-bit random numbers;
- `counter_dropout.py`: post-norm's LayerNorm(x + Dropout(y)), and the feed-forward's ReLU +
  dropout, each one kernel whose mask is computed in it from counters (no random-bits pass);
- `projected_loss.py`: the pre-softmax projection and the loss's reductions in one kernel, the
  logits [tokens, vocab] never written to memory (the backward recomputes them tile by tile).
"""
