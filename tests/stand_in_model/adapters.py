"""The stand-in's service adapters: the services' own fakes, with the stand-in's flag in their metadata."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from telefuser.serving.stream.fake import FakeSessionFactory
from telefuser.serving.video.fake import FakeVideoRunner

from .spec import STAND_IN


@dataclass
class StandInModel:
    tint: str


def pipeline_from_args(args: argparse.Namespace, runtime=None, **overrides) -> StandInModel:
    return StandInModel(STAND_IN.option(args, "tint"))


def build_video_runner(args: argparse.Namespace) -> FakeVideoRunner:
    runner = FakeVideoRunner(model=args.served_model_name, step_delay_s=0.0, defaults={"size": "64x64", "steps": 2})
    runner.metadata.update(runner="stand-in", tint=STAND_IN.build_pipeline(args, None).tint)
    return runner


def build_session_factory(args: argparse.Namespace) -> FakeSessionFactory:
    factory = FakeSessionFactory(defaults={"resolution": "64x48", "num_frames": 29}, max_sessions=1)
    factory.metadata.update(model="stand-in", tint=STAND_IN.build_pipeline(args, None).tint)
    return factory
