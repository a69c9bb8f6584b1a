from features.world.generate import main

raise SystemExit(main())
