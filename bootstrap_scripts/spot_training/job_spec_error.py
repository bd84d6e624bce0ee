"""The one error the job spec's checks raise (:mod:`.job_spec`, :mod:`.job_parts`)."""


class JobSpecError(ValueError):
    """A job setting the agent refuses; ``str()`` is one line: the key, what is wrong, what it got."""
