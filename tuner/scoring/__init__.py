"""What a study optimises: the Objective and Constraint seam and feasibility of constraints."""
