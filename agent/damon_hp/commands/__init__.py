"""One module per subcommand: each has set_argparser(parser) and main(args) -> exit code."""
