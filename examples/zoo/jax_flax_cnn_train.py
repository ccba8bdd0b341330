"""A Flax CNN training step: two conv blocks (Conv + BatchNorm-free GroupNorm + relu,
average pooling), a dense head, softmax cross-entropy, ``jax.value_and_grad`` and an
optax SGD-with-momentum update under ``jax.named_scope("optimizer")``."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

CLASSES = 4


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        for index, features in enumerate((8, 16)):
            x = nn.Conv(features, (3, 3), name=f"conv{index}")(x)
            x = nn.GroupNorm(num_groups=2, name=f"norm{index}")(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        return nn.Dense(CLASSES, name="head")(x.reshape(x.shape[0], -1))


def make_step():
    model = CNN()
    optimizer = optax.sgd(1e-2, momentum=0.9)

    def train_step(params, opt_state, images, labels):
        def loss_fn(params):
            logits = model.apply(params, images)
            with jax.named_scope("loss"):
                return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        with jax.named_scope("optimizer"):
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    images = jnp.ones((2, 8, 8, 3))
    params = model.init(jax.random.PRNGKey(0), images)
    labels = jnp.array([0, 3], dtype=jnp.int32)
    return train_step, (params, optimizer.init(params), images, labels)
