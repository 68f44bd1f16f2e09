"""What-if measurements on a GPU: `fxformer.bench` with one part of the step changed.

    python3 -m benchmarks.gpu.diag VARIANT [bench arguments...]

Diagnostics, not options: a variant that drops the mask trains a different model; it bounds
what a change of that part could gain, so the next change is chosen by measurement.

- `mask_heads_1`: the packed rows' segment mask goes to cuDNN as [b, 1, q, k] (one bias for all
  heads) instead of broadcast to [b, h, q, k];
- `no_mask`: packed rows get no segment mask at all (`is_causal` alone): the attention time of a
  kernel that knew the segments and skipped what they hide would be at most this;
- `one_pass_loss`: the loss's sums from one pass over the logits (`optim.one_pass_cross_entropy_sums`,
  the same loss and gradients: tests/test_train.py) instead of one reduction per quantity; now
  also the named option `--config.model.loss_impl=one_pass` (what benchmarks/gpu/run.sh measures).
"""

import sys

from fxformer import bench, cli, model, optim


def packed_arguments(variant: str):
    """`model.fused_mask_arguments` with the packed rows' mask changed as `variant` says (its
    broadcast undone, or left out); padded rows' arguments as they are."""
    original = model.fused_mask_arguments

    def arguments(mask: model.AttentionMask, num_heads: int) -> dict:
        given = original(mask, num_heads)
        if "mask" not in given:
            return given
        if variant == "no_mask":
            return {k: v for k, v in given.items() if k != "mask"}
        return {**given, "mask": given["mask"][:, :1]}  # [b, h, q, k] -> [b, 1, q, k]: the same for every head

    return arguments


if __name__ == "__main__":
    variant = sys.argv.pop(1)
    assert variant in ("mask_heads_1", "no_mask", "one_pass_loss"), variant
    if variant == "one_pass_loss":
        optim.LOSSES["reductions"] = optim.one_pass_cross_entropy_sums  # what loss_sums takes by default
    else:
        model.fused_mask_arguments = packed_arguments(variant)
    cli.run(bench.main)
