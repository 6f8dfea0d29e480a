return { steps = tonumbr("3") }
