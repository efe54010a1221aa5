from tokenplane.emulator.cli import main

main()
