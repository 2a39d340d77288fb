"""``python -m whetstone``: the command line, as the ``whetstone`` script."""

from whetstone.cli import main

if __name__ == "__main__":
    main()
