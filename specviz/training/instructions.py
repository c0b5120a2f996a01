"""Instruction prompts for distilling the English drafter, built from templates (no data set, no hub).

The distillation data are the target's own answers (sequence-level knowledge distillation, Kim
& Rush 2016), so the prompts need only be varied, not good: topics, activities, coding tasks
and story seeds crossed with the kinds of request a chat model meets (explain, list, compare,
write a poem or a story, write a function). The held-out prompts in ``assets/prompts_en.json``
are written by hand and never produced here; ``build`` drops any template prompt that equals
one of them anyway.
"""

from __future__ import annotations

import random

TOPICS = """photosynthesis, black holes, the water cycle, volcanoes, earthquakes, the immune system, vaccines,
DNA, evolution, gravity, magnetism, electricity, rainbows, the seasons, the moon's phases, tides, climate change,
the greenhouse effect, recycling, bees, whales, octopuses, dinosaurs, coral reefs, rainforests, deserts, glaciers,
the Roman Empire, ancient Egypt, the printing press, the Industrial Revolution, the French Revolution, the Silk Road,
the Renaissance, the Cold War, the invention of the telephone, the first moon landing, the Great Wall of China,
the internet, email, search engines, smartphones, batteries, solar panels, wind turbines, electric cars, airplanes,
bicycles, trains, bridges, skyscrapers, computers, operating systems, databases, encryption, passwords, cloud storage,
machine learning, neural networks, robots, 3D printing, GPS, Wi-Fi, Bluetooth, microwaves, refrigerators,
inflation, interest rates, taxes, budgeting, saving money, credit cards, the stock market, supply and demand,
small businesses, marketing, teamwork, leadership, time management, public speaking, job interviews, writing a resume,
sleep, exercise, nutrition, drinking water, stress, meditation, friendship, kindness, honesty, curiosity, motivation,
coffee, tea, bread, cheese, chocolate, pizza, rice, pasta, soup, salads, spices, baking, fermentation,
football, basketball, tennis, swimming, chess, running, yoga, the Olympic Games, mountains, rivers, oceans, islands,
cities, libraries, museums, music, jazz, the piano, the guitar, painting, photography, poetry, novels, theatre, films,
languages, grammar, learning a new language, mathematics, prime numbers, fractions, percentages, probability,
statistics, geometry, triangles, circles, algebra, the number zero, infinity, maps, clocks, calendars, money, cats,
dogs, horses, birds, butterflies, trees, flowers, gardens, houseplants, autumn, winter, spring, summer, rain, snow,
thunderstorms, the sun, the stars, planets, Mars, comets, telescopes, microscopes, the human heart, the brain, bones,
teeth, eyes, hearing, memory, dreams, habits, reading, writing letters, keeping a journal, camping, hiking, travel,
airports, hotels, maps and navigation, volunteering, neighbours, schools, teachers, homework, exams, universities,
the scientific method, experiments, measurement, units of length, temperature, energy, light, sound, heat, friction,
simple machines, levers, wheels, rockets, satellites, the atmosphere, clouds, wind, oceans currents, fish, frogs,
ants, spiders, elephants, penguins, wolves, forests, farming, wheat, apples, tomatoes, honey, salt, sugar, plastic,
glass, metal, wood, paper, cotton, wool, silk, bricks, concrete, fire, candles, lamps, electricity bills, open source
software, version control, spreadsheets, web browsers, websites, HTML, CSS, JavaScript, Python, recursion, sorting,
lists and arrays, dictionaries, loops, functions, variables, bugs, testing software, code reviews""".replace("\n", " ")

ACTIVITIES = """learning to cook, learning to code, staying focused, sleeping better, saving money, studying for exams,
starting a garden, running a first marathon, making friends in a new city, learning to draw, writing a story,
keeping a house tidy, travelling on a budget, reducing plastic waste, speaking in public, learning to swim,
taking better photos, reading more books, drinking more water, starting a small business, learning a language,
preparing for a job interview, working from home, caring for a puppy, planning a birthday party, staying healthy
in winter, organising a bookshelf, baking bread, making coffee at home, learning the guitar, writing emails,
being a good listener, managing stress, learning chess, hiking safely, packing for a trip, teaching a child to read,
growing tomatoes, fixing a flat bicycle tyre, choosing a laptop, backing up files, keeping passwords safe""".replace(
    "\n", " "
)

TASKS = """reverses a string, checks whether a number is prime, returns the largest item in a list, counts the vowels in
a word, computes the factorial of n, adds up the digits of a number, removes duplicates from a list, checks whether a
word is a palindrome, converts Celsius to Fahrenheit, finds the average of a list of numbers, merges two sorted lists,
returns the n-th Fibonacci number, counts how often each word appears in a sentence, sorts a list of names by length,
checks whether a year is a leap year, finds the second largest number in a list, flattens a nested list, capitalises
every word in a sentence, returns the common items of two lists, computes the greatest common divisor of two numbers,
reads a text file and counts its lines, checks whether two words are anagrams, rounds a price to two decimals,
returns the even numbers of a list, converts a number to binary, finds the longest word in a sentence""".replace(
    "\n", " "
)

CHARACTERS = """a curious robot, a lonely lighthouse keeper, a young dragon, a brave mouse, an old sailor, a clever
fox, a girl who loves maps, a forgetful wizard, a tiny turtle, a cat who wants to fly, a baker in a small town,
two best friends, a shy giant, a lost puppy, a space explorer, a talking tree""".replace("\n", " ")

EVENTS = """finds a secret door, learns to share, gets lost in a forest, builds a boat, makes a new friend, discovers
a hidden garden, solves a mystery, travels to the moon, wins a race, loses a favourite hat, plants a magic seed,
meets a dragon, bakes the biggest cake, saves the village from a storm""".replace("\n", " ")

_TOPIC_TEMPLATES = [
    "Explain {} in simple terms.",
    "What is {}?",
    "Give me three facts about {}.",
    "Why is {} important?",
    "Write a short poem about {}.",
    "Explain {} to a ten-year-old.",
    "What are the main ideas behind {}?",
    "Write a haiku about {}.",
    "Summarise the history of {} in a few sentences.",
    "What are common myths about {}?",
    "Describe {} in one paragraph.",
    "List five interesting things about {}.",
    "How does {} work?",
    "What should a beginner know about {}?",
    "Write a short, friendly paragraph introducing {}.",
    "What are the pros and cons of {}?",
    "Tell me a fun fact about {}.",
    "Can you explain {} step by step?",
]
_PAIR_TEMPLATES = ["Compare {} and {}.", "What is the difference between {} and {}?", "How are {} and {} related?"]
_ACTIVITY_TEMPLATES = [
    "Give me three tips for {}.",
    "How do I get started with {}?",
    "List five tips for {}.",
    "What are common mistakes when {}?",
    "Make a simple one-week plan for {}.",
]
_TASK_TEMPLATES = [
    "Write a Python function that {}.",
    "How would you write a function that {}?",
    "Write a short Python program that {} and explain it.",
]
_STORY_TEMPLATES = ["Write a short story about {} who {}.", "Tell a bedtime story about {} who {}."]


def _items(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build(count: int | None, seed: int = 0, exclude: set[str] = frozenset()) -> list[str]:
    """``count`` distinct prompts, drawn without replacement from every template crossing (seeded);
    ``count=None`` gives every prompt the templates make (7,006 less those in ``exclude``), shuffled.

    Raises:
        ValueError: when more prompts are asked for than the templates make.
    """
    topics, activities, tasks = _items(TOPICS), _items(ACTIVITIES), _items(TASKS)
    characters, events = _items(CHARACTERS), _items(EVENTS)
    rng = random.Random(seed)
    pool = [t.format(x) for t in _TOPIC_TEMPLATES for x in topics]
    pool += [t.format(x) for t in _ACTIVITY_TEMPLATES for x in activities]
    pool += [t.format(x) for t in _TASK_TEMPLATES for x in tasks]
    pool += [t.format(c, e) for t in _STORY_TEMPLATES for c in characters for e in events]
    pairs = [(a, b) for a in topics for b in topics if a < b]
    pool += [rng.choice(_PAIR_TEMPLATES).format(a, b) for a, b in rng.sample(pairs, min(len(pairs), 1500))]
    pool = [p[0].upper() + p[1:] for p in dict.fromkeys(pool)]
    held = {e.strip().lower() for e in exclude}
    pool = [p for p in pool if p.lower() not in held]
    if count is None:
        count = len(pool)
    if count > len(pool):
        raise ValueError(f"asked for {count} prompts; the templates make {len(pool)}")
    return rng.sample(pool, count)
