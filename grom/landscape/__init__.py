"""The landscape: GROM's trade-off over a grid of beta (or c) x w_r at a rho, each cell
the edit Run edit makes at those settings, read in one teacher-forced pass of the
unedited answers (`reader`), nearest cell first (`run.landscape`), with the cells no other
beats on forgetting and retain cost marked (`grid.pareto`)."""
from grom.landscape.grid import Cell, Grid, around, pareto, strength_name
from grom.landscape.reader import AnswerReader, Question
from grom.landscape.run import landscape

__all__ = ["AnswerReader", "Cell", "Grid", "Question", "around", "landscape", "pareto", "strength_name"]
