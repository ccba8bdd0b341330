"""An MLP-Mixer in Flax: patches by a strided conv, two mixer blocks (token mixing and
channel mixing MLPs, each after a LayerNorm, with residuals), mean pooling and a head."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class MlpBlock(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x):
        y = nn.gelu(nn.Dense(self.hidden, name="fc1")(x))
        return nn.Dense(x.shape[-1], name="fc2")(y)


class MixerBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        y = nn.LayerNorm(name="norm1")(x)
        y = MlpBlock(16, name="token_mixing")(y.swapaxes(1, 2)).swapaxes(1, 2)
        x = x + y
        y = nn.LayerNorm(name="norm2")(x)
        return x + MlpBlock(32, name="channel_mixing")(y)


class Mixer(nn.Module):
    @nn.compact
    def __call__(self, images):
        x = nn.Conv(16, (4, 4), strides=(4, 4), name="stem")(images)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        for index in range(2):
            x = MixerBlock(name=f"block{index}")(x)
        x = nn.LayerNorm(name="pre_head_norm")(x)
        return nn.Dense(10, name="head")(x.mean(axis=1))


def make_step():
    model = Mixer()
    images = jnp.ones((1, 16, 16, 3))
    return model.apply, (model.init(jax.random.PRNGKey(0), images), images)
