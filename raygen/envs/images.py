"""Temporary alias while other branches still import the old name: the Docker engine client is
``raygen.envs.docker_engine``; the image pre-flight and reaper are ``Environment.prepare`` / ``reap``
(reach a backend with ``raygen.envs.environment_class``). Removed before this session ends."""

from raygen.envs.docker_engine import *  # noqa: F403
from raygen.envs.labels import *  # noqa: F403


def reap(run_name, config):  # the old argument order
    from raygen.envs import environment_class

    return environment_class(config.type).reap(config, run_name)


async def prepare_images(config, images):
    from raygen.envs import environment_class

    return await environment_class(config.type).prepare(config, images)
