"""A Keras 3 CNN on the JAX backend, one training step: a Conv2D + BatchNormalization +
ReLU block, global average pooling and a Dense head, sparse categorical cross-entropy,
``jax.value_and_grad`` over ``model.stateless_call`` and a plain SGD update (no named
scope: the update is told from the rest by its data flow). BatchNormalization's moving
statistics come back as the new non-trainable state."""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402

CLASSES = 4


def build_model() -> keras.Model:
    inputs = keras.Input((8, 8, 3))
    x = inputs
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(name="relu")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="head")(x), name="cnn")


def make_step():
    keras.utils.set_random_seed(0)
    model = build_model()
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def loss(trainable, non_trainable, images, labels):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, images, training=True)
        return cross_entropy(labels, logits), non_trainable

    def train_step(trainable, non_trainable, images, labels):
        (value, non_trainable), grads = jax.value_and_grad(loss, has_aux=True)(
            trainable, non_trainable, images, labels)
        trainable = [weight - 0.01 * grad for weight, grad in zip(trainable, grads, strict=True)]
        return value, trainable, non_trainable

    trainable = [variable.value for variable in model.trainable_variables]
    non_trainable = [variable.value for variable in model.non_trainable_variables]
    images = jax.random.normal(jax.random.key(0), (4, 8, 8, 3), jnp.float32)
    labels = jnp.arange(4, dtype=jnp.int32) % CLASSES
    return train_step, (trainable, non_trainable, images, labels)
