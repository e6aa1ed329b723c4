# frozen_string_literal: true
#
# split_bolt.rb - word-count splitter (BasicBolt). Input field 0 is a sentence;
# it is split on ASCII whitespace, each token loses leading and trailing ASCII
# punctuation, ASCII A-Z are lowercased (other characters left alone), empty
# results are skipped, and every word is emitted as [word], anchored to the
# input. Tick tuples are only acked (the library's default tick hook).

require_relative 'multilang'

class SplitBolt < Multilang::BasicBolt
  WHITESPACE = /[ \t\n\r\f\v]+/
  PUNCT = %q(!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~)
  PUNCT_CLASS = "[#{PUNCT.chars.map { |c| format('\\x%02X', c.ord) }.join}]"
  EDGE_PUNCT = /\A#{PUNCT_CLASS}+|#{PUNCT_CLASS}+\z/

  def process(tup)
    sentence = tup.values[0]
    sentence.to_s.split(WHITESPACE).each do |token|
      word = token.gsub(EDGE_PUNCT, '').tr('A-Z', 'a-z')
      emit([word]) unless word.empty?
    end
  end
end

SplitBolt.run
