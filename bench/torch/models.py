"""The reference models in PyTorch, layer for layer those of examples/common/models.c (PyTorch's default
initialization, which nanoamp's layers reproduce).

  mlp      flatten -> Linear(784, 256) -> ReLU -> Linear(256, 10)
  cnn      [Conv2d(3x3, pad 1, bias) -> BatchNorm2d -> ReLU -> MaxPool2d(2)] for 1->32 and 32->64,
           flatten, Linear(64*7*7, 128) -> ReLU -> Linear(128, 10)
  resnet9  David Page's DAWNBench ResNet-9: prep conv_bn(3, 64); layer1 conv_bn(64, 128),
           MaxPool2d(2), Residual(conv_bn(128, 128), conv_bn(128, 128)); layer2 conv_bn(128, 256),
           MaxPool2d(2); layer3 conv_bn(256, 512), MaxPool2d(2), Residual(conv_bn(512, 512),
           conv_bn(512, 512)); global max pool; Linear(512, 10, bias=False); x 0.125.
           conv_bn = Conv2d(3x3, pad 1, bias=False) -> BatchNorm2d -> ReLU. 6,573,120 parameters.
"""
import torch
from torch import nn


class Residual(nn.Module):
    """y = x + body(x), as na_residual_new."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


class Scale(nn.Module):
    """y = factor * x, as na_scale_new."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class GlobalMaxPool2d(nn.Module):
    """[N, C, H, W] -> [N, C], as na_global_max_pool2d_new."""

    def forward(self, x):
        return torch.amax(x, dim=(2, 3))


def mnist_mlp():
    return nn.Sequential(nn.Flatten(1), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def _mnist_conv_block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.MaxPool2d(2))


def mnist_cnn():
    return nn.Sequential(_mnist_conv_block(1, 32), _mnist_conv_block(32, 64), nn.Flatten(1),
                         nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def conv_bn(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


def resnet9():
    return nn.Sequential(
        conv_bn(3, 64),
        nn.Sequential(conv_bn(64, 128), nn.MaxPool2d(2),
                      Residual(nn.Sequential(conv_bn(128, 128), conv_bn(128, 128)))),
        nn.Sequential(conv_bn(128, 256), nn.MaxPool2d(2)),
        nn.Sequential(conv_bn(256, 512), nn.MaxPool2d(2),
                      Residual(nn.Sequential(conv_bn(512, 512), conv_bn(512, 512)))),
        GlobalMaxPool2d(), nn.Linear(512, 10, bias=False), Scale(0.125))


MODELS = {"mlp": (mnist_mlp, (1, 28, 28)), "cnn": (mnist_cnn, (1, 28, 28)),
          "resnet9": (resnet9, (3, 32, 32))}


def by_name(name):
    """(model, (C, H, W) of one input image)"""
    build, shape = MODELS[name]
    return build(), shape
