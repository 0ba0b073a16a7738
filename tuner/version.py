"""The version of the search spaces' configurations (knob names, their meanings and their choices).

A stored schedule is a configuration of one version (`service.models.ScheduleKey`); bump this when a space's knobs
change meaning, and every schedule stored before is ignored rather than fitted to the new knobs.
"""

SPACE_VERSION = 1
