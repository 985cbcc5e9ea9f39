from raykit.cli import main

raise SystemExit(main())
