"""calctl subcommands; each module defines COMMAND, HELP, add_arguments(parser) and run(args)."""
