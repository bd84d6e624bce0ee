from stacks.training_stack import TrainingStack

__all__ = ["TrainingStack"]
