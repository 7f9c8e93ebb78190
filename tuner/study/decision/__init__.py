"""The decision rule of a study: a trial's outcome through the objectives (``evaluation``), the
study's noise (``noise``), a stage winner against the incumbent (``acceptance``), the plan of
stages and what each hands over (``stages``), and a near miss the next stages follow
(``lead``). Nothing here measures or stores: the loop and the state call it."""
