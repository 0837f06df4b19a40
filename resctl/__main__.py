from resctl.cli import main

main()
