from kvstate.cli import main

raise SystemExit(main())
