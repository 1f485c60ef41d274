"""Allow ``python -m kneepoint`` (used by pods and the sandbox runner)."""

from kneepoint.cli import main

if __name__ == "__main__":
    main()
