from captioner.world.generate import main

raise SystemExit(main())
