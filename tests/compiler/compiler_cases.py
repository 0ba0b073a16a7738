"""Small operator instances shared by the compiler tests (unique module name: tests are not packages)."""

from __future__ import annotations

# One small instance per operator, chosen to exercise stride, padding, dilation,
# groups and output padding while compiling in a fraction of a second untransformed.
SMALL: dict[str, dict[str, int]] = {
    "conv2d": dict(batch=2, in_channels=3, height=9, width=8, out_channels=4, kernel=3, stride=2, padding=1),
    "depthwise_conv2d": dict(batch=1, channels=4, height=8, width=7, kernel=3, padding=2, dilation=2),
    "group_conv2d": dict(batch=1, in_channels=4, height=7, width=7, out_channels=6, kernel=3, groups=2, padding=1),
    "dilated_conv2d": dict(batch=1, in_channels=3, height=9, width=9, out_channels=4, kernel=3),
    "conv1d": dict(batch=1, in_channels=3, width=16, out_channels=5, kernel=3, stride=2, padding=1),
    "conv3d": dict(batch=1, in_channels=2, depth=4, height=5, width=5, out_channels=3, kernel=3, padding=1),
    "conv2d_transpose": dict(
        batch=1, in_channels=4, height=5, width=5, out_channels=6, kernel=4, stride=2, padding=1,
        output_padding=1, groups=2,
    ),
    "dense": dict(m=5, n=7, k=9),
    "batch_matmul": dict(batch=2, m=5, n=7, k=9),
}
