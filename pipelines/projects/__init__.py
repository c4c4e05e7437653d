"""AI projects: many teams on one platform, each in its own space (zones, experiment, registered model,
Feast project, Triton models, gateway keys, quotas), sharing the servers and one base model.

`registry` keeps the project list (members, roles, hashed gateway keys, quotas) in one state file;
`settings_for` scopes the typed settings to a project (`pipelines.config.Settings.project`).
"""

from pipelines.projects.registry import (  # noqa: F401 (the package's API)
    ROLES,
    Project,
    ProjectError,
    settings_for,
)
