"""The offline world: procedurally rendered shapes scenes with captions and a scene graph."""

from features.world.scene import Scene, WorldObject, sample_scene

__all__ = ["Scene", "WorldObject", "sample_scene"]
