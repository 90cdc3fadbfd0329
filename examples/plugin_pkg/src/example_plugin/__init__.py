"""Small image classifiers: an MLP and a CNN for 32x32 inputs."""

from example_plugin.nets import tiny_cnn, tiny_mlp

__all__ = ["tiny_cnn", "tiny_mlp"]
__version__ = "0.1.0"
