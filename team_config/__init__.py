"""Team configuration: the validated user interface of the app."""

from team_config.loader import DEFAULT_TEAM, ConfigError, Team, load_team, load_teams
from team_config.model import ClusterConfig, TeamConfig, instance_architecture

__all__ = [
    "DEFAULT_TEAM",
    "ClusterConfig",
    "ConfigError",
    "Team",
    "TeamConfig",
    "instance_architecture",
    "load_team",
    "load_teams",
]
