"""The embedded synthetic world: scenes with exact ground truth, texts, tokenizer, tiny VLMs."""

from .config import DIFFICULTIES, WorldConfig, world_config
from .dataset import build_world, generate_scenes, load_world, read_world
from .render import render
from .scene import Scene, SceneObject
from .texts import caption, description, open_questions, parse_description, yes_no_questions

__all__ = [
    "DIFFICULTIES", "Scene", "SceneObject", "WorldConfig", "build_world", "caption", "description",
    "generate_scenes", "load_world", "open_questions", "parse_description", "read_world", "render",
    "world_config", "yes_no_questions",
]
