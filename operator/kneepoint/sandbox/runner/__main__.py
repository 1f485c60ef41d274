"""``python -m kneepoint.sandbox.runner``."""

from kneepoint.sandbox.runner.main import main

main()
