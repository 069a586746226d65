"""Registry test module: a trigger naming a task no module declares."""

from tasks import define_trigger

stray = define_trigger(name="stray-hook", task="no-such-task")
